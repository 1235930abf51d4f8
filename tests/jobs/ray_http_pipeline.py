"""A plain Ray job, unmodified by gkd: an inference server over HTTP hosted by a Ray actor (aiohttp.web on the
actor's event loop, as vLLM's and SGLang's servers are hosted), and a rollout actor that sends it requests
with `requests`, a round at a time, the driver waiting on the rollout. After HEALTHY_S the server's handler
stops returning (an inference request stalled inside the server: verl #7180): the rollout waits on an HTTP
request, outside any Ray call, and the driver on the rollout.

    python ray_http_pipeline.py HEALTHY_S   # healthy rounds for HEALTHY_S seconds, then the server stalls
"""

import asyncio
import sys
import time

import ray
import requests
from aiohttp import web

WAIT_S = 3600  # every wait of the job has a bound; the stall holds until the run is stopped
REQUESTS = 4  # a round's requests, one after another
# a query string that must never reach the run's record (a key passed in a URL)
SECRET_QUERY = "api_key=never-in-the-log"


@ray.remote(num_cpus=0)
class InferenceServer:
    async def start(self) -> int:
        """Serve on an unused port of the loopback address; its number."""
        self.stalled = False
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return self.runner.addresses[0][1]

    async def stall(self) -> None:
        self.stalled = True

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.stalled:
            await asyncio.Event().wait()  # the request that never returns
        await asyncio.sleep(0.02)  # a request's decoding
        return web.json_response({"tokens": body["n"]})


@ray.remote(num_cpus=0)
class Rollouter:
    def rollout(self, url: str, n: int) -> int:
        for i in range(n):
            answer = requests.post(f"{url}/generate?{SECRET_QUERY}", json={"n": i}, timeout=WAIT_S)
            answer.raise_for_status()
        return n


if __name__ == "__main__":
    healthy_s = float(sys.argv[1])
    ray.init(num_cpus=2)
    server = InferenceServer.remote()
    url = f"http://127.0.0.1:{ray.get(server.start.remote(), timeout=60)}"
    rollouter = Rollouter.remote()
    rounds, until = 0, time.monotonic() + healthy_s
    while time.monotonic() < until:
        rounds += 1
        ray.get(rollouter.rollout.remote(url, REQUESTS), timeout=WAIT_S)
    print("HEALTHY ROUNDS", rounds, flush=True)
    ray.get(server.stall.remote(), timeout=60)
    print("STALLED AT", time.time(), flush=True)
    ray.get(rollouter.rollout.remote(url, REQUESTS), timeout=WAIT_S)
