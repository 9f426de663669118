"""Reads a .wandb file with wandb's own DataStore (header, block framing, checksums) and
parses every record with wandb's own protobufs (wandb.proto.wandb_internal_pb2); prints
{"wandb": version, "records": [...]} as JSON, one entry per record with the fields
zerotrain writes (tests/unit/test_wandb.cpp compares them).

usage: python read_wandb.py FILE.wandb
Exit status 3 (with the reason on stdout) when this wandb has no Python DataStore: wandb
0.30 removed wandb/sdk/internal/datastore.py (wandb-core reads the files since); the test
then skips. Any other failure is a non-zero status with Python's error.
"""
import json
import sys

import wandb

try:
    from wandb.sdk.internal import datastore
except ImportError:
    print(f"wandb {wandb.__version__} has no Python DataStore (wandb/sdk/internal/datastore.py, "
          "removed in 0.30): install wandb<0.30 for this check")
    sys.exit(3)
from wandb.proto import wandb_internal_pb2 as pb

wandb._assert_is_internal_process = True  # older DataStores assert they run in wandb's service
store = datastore.DataStore()
store.open_for_scan(sys.argv[1])  # checks the ":W&B" header, magic and version


def items(repeated):
    out = []
    for it in repeated:
        json.loads(it.value_json)  # every value must be JSON (Python's, which allows NaN)
        out.append([it.key, it.value_json])
    return out


records = []
while True:
    data = store.scan_data()  # asserts on a bad checksum, padding or chunk order
    if data is None:
        break
    r = pb.Record()
    r.ParseFromString(data)
    kind = r.WhichOneof("record_type")
    out = {"type": kind, "num": r.num, "bytes": len(data),
           # protobuf writes fields in number order: equal bytes mean no field was out of
           # place, unknown or written where proto3 leaves a default out.
           "reserialized_equal": r.SerializeToString() == data}
    if kind == "run":
        x = r.run
        out.update(run_id=x.run_id, entity=x.entity, project=x.project, run_group=x.run_group,
                   job_type=x.job_type, display_name=x.display_name, host=x.host,
                   start_seconds=x.start_time.seconds, start_nanos=x.start_time.nanos)
    elif kind == "history":
        out.update(step=r.history.step.num, has_step=r.history.HasField("step"), items=items(r.history.item))
    elif kind == "summary":
        out.update(items=items(r.summary.update))
    elif kind == "exit":
        out.update(exit_code=r.exit.exit_code, runtime=r.exit.runtime)
    records.append(out)
store.close()
print(json.dumps({"wandb": wandb.__version__, "records": records}))
