"""A small but real GRPO post-training job that lives its whole life on placectl.

``task`` is the math (policy, task, reward, loss: torch only, no Ray), ``workers`` the
processes placectl places (trainer ranks in a DDP group, rollout workers colocated with
them, reward workers on a node), ``job`` the driver's loop with its recovery, and
``scripts/job/train.py`` the entry point that runs drivers and injects faults.
"""
