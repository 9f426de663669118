"""Reads TensorBoard event files with TensorBoard's own EventAccumulator and prints
{tag: [[step, value, wall_time], ...]} as JSON (tests/unit/test_monitor.cpp).

usage: python read_tfevents.py LOGDIR
"""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator as ea

acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})  # 0: keep every point
acc.Reload()
out = {tag: [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
print(json.dumps(out))
