"""One rank of a torchrun job its user started with ``GKD_WATCH=1``, unmodified by gkd: it loads the
``verl.plugins`` entry points exactly as ``import verl`` does in each of verl's processes (verl's SFT trainer
runs under torchrun), then all-reduces over gloo until the file ``JOB_GO_FILE`` appears (the test has seen
what it looks for), and ends. Once in the group, each rank writes its pid to ``JOB_PIDS_DIR/rank<RANK>.round<N>``
(N: torchrun's count of restarts). ``JOB_EXIT_IN_FIRST_ROUND=R``: rank R exits at once in torchrun's first round of
starting its workers, so that torchrun (``--max-restarts``) starts every rank again."""

import logging
import os
import sys
import time
from importlib.metadata import entry_points

for ep in entry_points(group="verl.plugins"):  # verl/__init__.py: each plugin loaded, its error logged at DEBUG
    try:
        ep.load()
    except Exception as e:
        logging.getLogger(__name__).debug("Failed to load %s: %s", ep.name, e)

ROUND = os.environ["TORCHELASTIC_RESTART_COUNT"]
if os.environ.get("JOB_EXIT_IN_FIRST_ROUND") == os.environ["RANK"] and ROUND == "0":
    print(f"RANK {os.environ['RANK']} EXITS IN THE FIRST ROUND", flush=True)
    sys.exit(1)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

GO_WAIT_S = 600.0

dist.init_process_group("gloo")
rank = dist.get_rank()
pids = os.path.join(os.environ["JOB_PIDS_DIR"], f"rank{rank}.round{ROUND}")
with open(pids + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(pids + ".tmp", pids)
deadline = time.monotonic() + GO_WAIT_S
while True:
    stop = os.path.exists(os.environ["JOB_GO_FILE"]) or time.monotonic() > deadline
    flag = torch.tensor([float(stop)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the ranks leave the loop together, in the same round
    if flag.item():
        break
    time.sleep(0.1)
if not os.path.exists(os.environ["JOB_GO_FILE"]):
    print(f"rank {rank}: no {os.environ['JOB_GO_FILE']} within {GO_WAIT_S:g} s", file=sys.stderr, flush=True)
    sys.exit(3)
dist.barrier()
dist.destroy_process_group()
print(f"RANK {rank} DONE", flush=True)
