"""A plain Ray job, unmodified by gkd: an inference server over HTTP hosted by a Ray actor (aiohttp.web on the
actor's event loop, as vLLM's and SGLang's servers are hosted), a code tool served over HTTP by a process
outside Ray (a sandbox, as agentic RL calls one), and a rollout actor that sends each a request in turn with
`requests`, a round at a time, the driver waiting on the rollout. After HEALTHY_S one of them stops
answering: the inference server's handler (an inference request stalled inside the server: verl #7180), or
the tool (a sandbox that never answers: prime-rl #2459). The rollout then waits on an HTTP request, outside
any Ray call, and the driver on the rollout.

    python ray_http_pipeline.py HEALTHY_S [server|tool]   # healthy rounds, then that one stalls (server)
    python ray_http_pipeline.py --tool                    # the tool alone: prints its port, serves until killed
"""

import asyncio
import subprocess
import sys
import time

from aiohttp import web

WAIT_S = 3600  # every wait of the job has a bound; the stall holds until the run is stopped
REQUESTS = 4  # a round's requests to each, one after another
# a query string that must never reach the run's record (a key passed in a URL)
SECRET_QUERY = "api_key=never-in-the-log"


class Stallable:
    """An aiohttp.web handler that answers after a moment, or, once told to stall, never."""

    def __init__(self):
        self.stalled = False

    async def answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.stalled:
            await asyncio.Event().wait()  # the request that never returns
        await asyncio.sleep(0.02)  # a request's decoding, a tool's run
        return web.json_response({"n": body["n"]})

    async def stall(self, request: web.Request | None = None) -> web.Response:
        self.stalled = True
        return web.json_response({})

    async def serve(self, route: str) -> web.AppRunner:
        """Serve ``route`` (and /stall) on an unused port of the loopback address."""
        app = web.Application()
        app.router.add_post(route, self.answer)
        app.router.add_post("/stall", self.stall)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner


def tool_main() -> None:
    async def main():
        runner = await Stallable().serve("/run")
        print(runner.addresses[0][1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


if __name__ == "__main__" and sys.argv[1:] == ["--tool"]:
    tool_main()
    sys.exit(0)

import ray  # noqa: E402  (the tool alone runs without Ray)
import requests  # noqa: E402


@ray.remote(num_cpus=0)
class InferenceServer:
    async def start(self) -> int:
        self.handler = Stallable()
        self.runner = await self.handler.serve("/generate")
        return self.runner.addresses[0][1]

    async def stall(self) -> None:
        await self.handler.stall()


@ray.remote(num_cpus=0)
class Rollouter:
    def rollout(self, server: str, tool: str, n: int) -> int:
        for i in range(n):
            for url in (f"{server}/generate?{SECRET_QUERY}", f"{tool}/run"):
                answer = requests.post(url, json={"n": i}, timeout=WAIT_S)
                answer.raise_for_status()
        return n


if __name__ == "__main__":
    healthy_s, stalling = float(sys.argv[1]), (sys.argv[2:] or ["server"])[0]
    tool_process = subprocess.Popen([sys.executable, __file__, "--tool"], stdout=subprocess.PIPE, text=True)
    try:
        tool = f"http://127.0.0.1:{tool_process.stdout.readline().strip()}"
        print("TOOL PID", tool_process.pid, flush=True)
        ray.init(num_cpus=2)
        server = InferenceServer.remote()
        url = f"http://127.0.0.1:{ray.get(server.start.remote(), timeout=60)}"
        rollouter = Rollouter.remote()
        rounds, until = 0, time.monotonic() + healthy_s
        while time.monotonic() < until:
            rounds += 1
            ray.get(rollouter.rollout.remote(url, tool, REQUESTS), timeout=WAIT_S)
        print("HEALTHY ROUNDS", rounds, flush=True)
        if stalling == "tool":
            requests.post(f"{tool}/stall", json={}, timeout=60).raise_for_status()
        else:
            ray.get(server.stall.remote(), timeout=60)
        print("STALLED AT", time.time(), flush=True)
        ray.get(rollouter.rollout.remote(url, tool, REQUESTS), timeout=WAIT_S)
    finally:
        tool_process.kill()
