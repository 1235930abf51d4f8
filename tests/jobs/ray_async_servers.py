"""A plain Ray job, unmodified by gkd: a pool of four async server actors, each sent eight concurrent
``generate`` calls a round (a rollout's inference servers, as verl's async rollout runs them), the driver
waiting on all 32. After a while one server's coroutines stop returning (a request stalled inside the
server: verl #7180's "GPUs idle, processes alive"), and the round waits on it forever.

    python ray_async_servers.py HEALTHY_S   # healthy rounds for HEALTHY_S seconds, then Server/2 stalls
"""

import asyncio
import sys
import time

import ray

SERVERS, CONCURRENT = 4, 8
WAIT_S = 3600  # every wait of the job has a bound; the stall holds until the run is stopped
STALLED = 2


@ray.remote(num_cpus=0, max_concurrency=CONCURRENT)
class Server:
    def __init__(self):
        self.stalled = asyncio.Event()  # a request queue nobody drains once it is set

    async def generate(self, n: int, stall: bool) -> int:
        if stall:
            self.stalled.set()
        if self.stalled.is_set():
            await asyncio.Event().wait()  # the request that never returns
        await asyncio.sleep(0.05)  # a request's decoding
        return n


if __name__ == "__main__":
    healthy_s = float(sys.argv[1])
    ray.init(num_cpus=2)
    servers = [Server.remote() for _ in range(SERVERS)]
    rounds, until = 0, time.monotonic() + healthy_s
    while time.monotonic() < until:
        rounds += 1
        ray.get([s.generate.remote(rounds, stall=False) for s in servers for _ in range(CONCURRENT)], timeout=WAIT_S)
    print("HEALTHY ROUNDS", rounds, flush=True)
    print("STALLED AT", time.time(), flush=True)
    ray.get([s.generate.remote(rounds + 1, stall=i == STALLED) for i, s in enumerate(servers)
             for _ in range(CONCURRENT)], timeout=WAIT_S)
