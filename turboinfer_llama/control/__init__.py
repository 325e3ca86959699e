"""Deciding GPU frequencies: forecaster, workload model, tube MPC, governor loop."""
