"""A plain Ray job of an async RL pipeline's shape, unmodified by gkd (verl's fully async policy, slimmed): an
inference server over HTTP in a Ray actor, a code tool over HTTP in a process outside Ray, a rollouter (an
async actor) that sends each a request per sample and puts the sample into a message queue (an async actor
over an asyncio.Condition), parked at a staleness gate while it is ``STALENESS`` samples ahead of the
trainer's parameter version, and two trainer ranks that take a sample each per step, all-reduce their
gradient over gloo, and (rank 0) send the rollouter the new version.

    python ray_async_pipeline.py HEALTHY_S CAUSE [--verl-queue | --slime | --slime-tasks]

After HEALTHY_S, CAUSE stalls it (the driver prints "STALLED AT <time>"), one at a time:
    server   the inference server's handler never returns (an inference request stalled inside the server)
    tool     the tool never answers (a sandbox: prime-rl #2459)
    rank     Trainer/1 never joins the gradient all-reduce (its step's compute hangs)
    gate     Trainer/0 stops sending the new parameter version, so the gate stays shut (verl #3895)
    none     nothing: healthy until stopped
--verl-queue: verl's own MessageQueue actor (verl.experimental.fully_async_policy) in place of this one
--slime: slime's shape in place of the rollouter and the queue: one rollout manager (a threaded actor) whose
    samples come from a producer thread of its own (behind the gate, its requests over urllib) through a
    queue.Queue, and whose get_sample polls that queue with a timeout, as slime's collector does
--slime-tasks: the same, its producer a Ray task (a remote function's call that runs until the job ends) that
    passes the manager's gate (a call of it), sends the requests and puts each sample into it
    python ray_async_pipeline.py --tool   # the tool alone: prints its port, serves until killed
"""

import asyncio
import collections
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from aiohttp import web

WAIT_S = 3600  # every wait of the job has a bound; a stall holds until the run is stopped
STALENESS = 4  # samples the rollouter may run ahead of the trainer's parameter version
DECODE_S = 0.1  # a request's work, in the server and in the tool
POLL_S = 1.0  # slime's collector's poll of its queue


class Stallable:
    """An aiohttp.web app that answers after a moment, or, once told to stall, never."""

    def __init__(self):
        self.stalled = False

    async def answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.stalled:
            await asyncio.Event().wait()  # the request that never returns
        await asyncio.sleep(DECODE_S)
        return web.json_response({"n": body["n"]})

    async def stall(self, request: web.Request | None = None) -> web.Response:
        self.stalled = True
        return web.json_response({})

    async def serve(self, route: str) -> int:
        """Serve ``route`` (and /stall) on an unused port of the loopback address; the port."""
        app = web.Application()
        app.router.add_post(route, self.answer)
        app.router.add_post("/stall", self.stall)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return self.runner.addresses[0][1]


def tool_main() -> None:
    async def main():
        print(await Stallable().serve("/run"), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


if __name__ == "__main__" and sys.argv[1:] == ["--tool"]:
    tool_main()
    sys.exit(0)

import aiohttp  # noqa: E402
import ray  # noqa: E402


@ray.remote(num_cpus=0)
class InferenceServer:
    async def start(self) -> int:
        self.app = Stallable()
        return await self.app.serve("/generate")

    async def stall(self) -> None:
        await self.app.stall()


@ray.remote(num_cpus=0)
class MessageQueue:
    """Samples from the rollouter to the trainer ranks, in order."""

    def __init__(self):
        self.samples = collections.deque()
        self.ready = asyncio.Condition()

    async def put_sample(self, sample: dict) -> None:
        async with self.ready:
            self.samples.append(sample)
            self.ready.notify()

    async def get_sample(self) -> dict:
        async with self.ready:
            await self.ready.wait_for(lambda: self.samples)
            return self.samples.popleft()


def message_queue(verls: bool):
    """This job's queue, or verl's own (its ``get_sample`` answers the sample and the queue's size)."""
    if not verls:
        return MessageQueue.remote()
    from omegaconf import OmegaConf
    from verl.experimental.fully_async_policy.message_queue import MessageQueue as VerlMessageQueue

    return VerlMessageQueue.options(num_cpus=0).remote(OmegaConf.create({}), max_queue_size=1000)


@ray.remote(num_cpus=0)
class Rollouter:
    def __init__(self):
        self.produced = 0
        self.param_version = 0
        self.gate = asyncio.Condition()

    async def update_param_version(self, version: int) -> None:
        async with self.gate:
            self.param_version = version
            self.gate.notify_all()

    async def run(self, server: str, tool: str, samples) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session:
            while True:
                async with self.gate:  # the staleness gate: at most STALENESS samples ahead of the trainer
                    while self.produced - 2 * self.param_version >= STALENESS:
                        await self.gate.wait()
                for url in (f"{server}/generate", f"{tool}/run"):
                    async with session.post(url, json={"n": self.produced}) as answer:
                        answer.raise_for_status()
                await samples.put_sample.remote({"n": self.produced, "version": self.param_version})
                self.produced += 1


@ray.remote(num_cpus=0, max_concurrency=8)
class RolloutManager:
    """slime's shape: the queue and the rollouter in one threaded actor, fed by a thread of its own."""

    def __init__(self):
        self.samples: queue.Queue = queue.Queue()
        self.produced = 0
        self.param_version = 0
        self.gate = threading.Condition()

    def start(self, server: str, tool: str) -> None:
        threading.Thread(target=self.produce, args=(server, tool), name="rollout-producer", daemon=True).start()

    def produce(self, server: str, tool: str) -> None:
        while True:
            n, version = self.pass_gate()
            generate(server, tool, n)
            self.put_sample({"n": n, "version": version})

    def pass_gate(self) -> tuple[int, int]:
        """The staleness gate: at most STALENESS samples ahead of the trainer. The sample's number and version."""
        with self.gate:
            while self.produced - 2 * self.param_version >= STALENESS:
                self.gate.wait(WAIT_S)
            self.produced += 1
            return self.produced - 1, self.param_version

    def put_sample(self, sample: dict) -> None:
        self.samples.put(sample)

    def update_param_version(self, version: int) -> None:
        with self.gate:
            self.param_version = version
            self.gate.notify_all()

    def get_sample(self) -> dict:
        while True:  # slime's collector: poll the queue with a timeout until a sample comes
            try:
                return self.samples.get(timeout=POLL_S)
            except queue.Empty:
                continue


def generate(server: str, tool: str, n: int) -> None:
    """A sample's requests: the inference server's, then the tool's."""
    for url in (f"{server}/generate", f"{tool}/run"):
        request = urllib.request.Request(url, data=json.dumps({"n": n}).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=WAIT_S):
            pass


@ray.remote(num_cpus=0)
def produce(manager, server: str, tool: str) -> None:
    """slime's producer as a Ray task: past the manager's gate, the requests, the sample into its queue."""
    while True:
        n, version = ray.get(manager.pass_gate.remote(), timeout=WAIT_S)
        generate(server, tool, n)
        ray.get(manager.put_sample.remote({"n": n, "version": version}), timeout=WAIT_S)


@ray.remote(num_cpus=0)
class Trainer:
    def __init__(self, rank: int, world: int, port: int):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        self.rank, self.torch, self.dist = rank, torch, dist

    def ready(self) -> bool:
        return True

    def train(self, samples, rollouter, stall_flag: str) -> int:
        step = 0
        while True:
            sample = ray.get(samples.get_sample.remote(), timeout=WAIT_S)
            sample = sample[0] if isinstance(sample, tuple) else sample  # (verl's: the sample and the queue's size)
            stalled = os.path.exists(stall_flag) and open(stall_flag).read()
            if stalled == "rank" and self.rank == 1:
                time.sleep(WAIT_S)  # its compute hangs: it never joins the all-reduce
            grad = self.torch.full((4,), float(sample["n"]))
            self.dist.all_reduce(grad)
            step += 1
            if self.rank == 0 and stalled != "gate":  # the new version, to the rollouter's gate
                ray.get(rollouter.update_param_version.remote(step), timeout=60)


def main(healthy_s: float, cause: str, verls_queue: bool, slime: str) -> None:
    tool_process = subprocess.Popen([sys.executable, __file__, "--tool"], stdout=subprocess.PIPE, text=True)
    stall_flag = os.path.join(tempfile.mkdtemp(prefix="pipeline-"), "stall")
    try:
        tool = f"http://127.0.0.1:{tool_process.stdout.readline().strip()}"
        print("TOOL PID", tool_process.pid, flush=True)
        ray.init(num_cpus=2)
        server = InferenceServer.remote()
        url = f"http://127.0.0.1:{ray.get(server.start.remote(), timeout=90)}"
        if slime:  # the queue and the rollouter are one actor, its producer a thread of its own or a task
            samples = rollouter = RolloutManager.remote()
            if slime == "thread":
                ray.get(rollouter.start.remote(url, tool), timeout=60)
            else:
                producing = produce.remote(rollouter, url, tool)  # noqa: F841  (it runs until the job ends)
        else:
            samples, rollouter = message_queue(verls_queue), Rollouter.remote()
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        trainers = [Trainer.remote(rank, 2, port) for rank in range(2)]
        ray.get([t.ready.remote() for t in trainers], timeout=120)
        if not slime:
            rollouter.run.remote(url, tool, samples)
        training = [t.train.remote(samples, rollouter, stall_flag) for t in trainers]
        ready, _ = ray.wait(training, timeout=healthy_s)
        if ready:
            ray.get(ready)  # a failure of the healthy pipeline: said as the job's own
        if cause == "server":
            ray.get(server.stall.remote(), timeout=60)
        elif cause == "tool":
            with urllib.request.urlopen(urllib.request.Request(f"{tool}/stall", data=b"{}", method="POST"),
                                        timeout=60):
                pass
        elif cause in ("rank", "gate"):
            with open(stall_flag, "w") as f:
                f.write(cause)
        print("STALLED AT", time.time(), flush=True)
        ray.get(training, timeout=WAIT_S)
    finally:
        tool_process.kill()


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2], "--verl-queue" in sys.argv[3:],
         "thread" if "--slime" in sys.argv[3:] else "task" if "--slime-tasks" in sys.argv[3:] else "")
