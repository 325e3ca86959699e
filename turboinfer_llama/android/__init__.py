"""Android phones from the host over adb: the link and persistent shell, probing,
module deployment, fuel-gauge calibration and battery energy measurement."""
