"""Make an existing agent trainable: the rollout decorator, update_reward, framework hooks.

Light by design: importing this package never imports torch or the coordinator.
"""
