"""A plain Ray job, unmodified by gkd: an inference server over HTTP hosted by a Ray actor (aiohttp.web on the
actor's event loop, as vLLM's and SGLang's servers are hosted), a code tool served over HTTP by a process
outside Ray (a sandbox, as agentic RL calls one), and a rollout actor that sends each a request in turn with
`requests`, a round at a time, the driver waiting on the rollout. After HEALTHY_S one of them stops
answering: the inference server's handler (an inference request stalled inside the server: verl #7180), or
the tool (a sandbox that never answers: prime-rl #2459). The rollout then waits on an HTTP request, outside
any Ray call, and the driver on the rollout.

    python ray_http_pipeline.py HEALTHY_S [server|tool] [aiohttp|fastapi]
        healthy rounds, then that one stalls (the server); the inference server on aiohttp.web and the
        requests sent with `requests` (aiohttp), or on FastAPI under uvicorn and sent with httpx (fastapi),
        as vLLM and SGLang serve and their clients send
    python ray_http_pipeline.py --tool   # the tool alone: prints its port, serves until killed
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

    async def reply(self, body: dict) -> dict:
        if self.stalled:
            await asyncio.Event().wait()  # the request that never returns
        await asyncio.sleep(0.02)  # a request's decoding, a tool's run
        return {"n": body["n"]}

    async def answer(self, request: web.Request) -> web.Response:
        return web.json_response(await self.reply(await request.json()))

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
    async def start(self, stack: str) -> int:
        self.handler = Stallable()
        if stack == "aiohttp":
            self.runner = await self.handler.serve("/generate")
            return self.runner.addresses[0][1]
        import uvicorn
        from fastapi import FastAPI, Request

        api = FastAPI()

        @api.post("/generate")
        async def generate(request: Request) -> dict:
            return await self.handler.reply(await request.json())

        server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
        self.serving = asyncio.get_running_loop().create_task(server.serve())
        for _ in range(600):  # a minute at most
            if server.started:
                return server.servers[0].sockets[0].getsockname()[1]
            await asyncio.sleep(0.1)
        raise TimeoutError("uvicorn did not start within a minute")

    async def stall(self) -> None:
        await self.handler.stall()


@ray.remote(num_cpus=0)
class Rollouter:
    def __init__(self, stack: str):
        if stack == "fastapi":
            import httpx

            self.post = httpx.post
        else:
            self.post = requests.post

    def rollout(self, server: str, tool: str, n: int) -> int:
        for i in range(n):
            for url in (f"{server}/generate?{SECRET_QUERY}", f"{tool}/run"):
                answer = self.post(url, json={"n": i}, timeout=WAIT_S)
                answer.raise_for_status()
        return n


if __name__ == "__main__":
    healthy_s, stalling, stack = float(sys.argv[1]), (sys.argv[2:] or ["server"])[0], (sys.argv[3:] or ["aiohttp"])[0]
    tool_process = subprocess.Popen([sys.executable, __file__, "--tool"], stdout=subprocess.PIPE, text=True)
    try:
        tool = f"http://127.0.0.1:{tool_process.stdout.readline().strip()}"
        print("TOOL PID", tool_process.pid, flush=True)
        ray.init(num_cpus=2)
        server = InferenceServer.remote()
        url = f"http://127.0.0.1:{ray.get(server.start.remote(stack), timeout=90)}"
        rollouter = Rollouter.remote(stack)
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
