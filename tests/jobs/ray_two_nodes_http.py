"""A plain Ray job, unmodified by gkd, on a running cluster of two nodes (``ray.init()`` joins the one
``RAY_ADDRESS`` names): an inference server (an async actor serving over aiohttp.web) on the second node,
listening on that node's address, and a client actor on the head that sends it one request after another.
After HEALTHY_S the server's handler never returns.

    python ray_two_nodes_http.py HEALTHY_S
"""

import asyncio
import sys
import time

import aiohttp
import ray
from aiohttp import web

WAIT_S = 3600  # every wait of the job has a bound; the stall holds until the run is stopped


@ray.remote(num_cpus=0)
class InferenceServer:
    async def start(self) -> str:
        self.stalled = False
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        host = ray.util.get_node_ip_address()  # this node's address: the client is on another
        await web.TCPSite(self.runner, host, 0).start()
        return f"http://{host}:{self.runner.addresses[0][1]}"

    async def generate(self, request: web.Request) -> web.Response:
        if self.stalled:
            await asyncio.Event().wait()  # the request that never returns
        await asyncio.sleep(0.05)
        return web.json_response({})

    async def stall(self) -> None:
        self.stalled = True


@ray.remote(num_cpus=0)
class Client:
    async def run(self, url: str) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.post(f"{url}/generate", json={}) as answer:
                    await answer.read()


if __name__ == "__main__":
    ray.init()
    server = InferenceServer.options(resources={"node2": 0.01}).remote()
    url = ray.get(server.start.remote(), timeout=90)
    running = Client.options(resources={"head": 0.01}).remote().run.remote(url)
    time.sleep(float(sys.argv[1]))
    ray.get(server.stall.remote(), timeout=60)
    print("STALLED AT", time.time(), flush=True)
    ray.get(running, timeout=WAIT_S)
