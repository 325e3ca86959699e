"""Android phones from the host over adb: probing, module deployment, fuel-gauge
calibration and battery energy measurement. The transport itself (adb link, shell
session, settings) lives below, in ``devices/adb_link.py`` and ``devices/adb_settings.py``."""
