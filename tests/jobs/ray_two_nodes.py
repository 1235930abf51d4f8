"""A plain Ray job, unmodified by gkd, on a running cluster of two nodes (``ray.init()`` joins the one
``RAY_ADDRESS`` names): one actor on each node (their custom resources ``head`` and ``node2``); the one
on the second node never finishes its second ``work`` call, which its peer on the head finishes."""

import time

import ray


@ray.remote(num_cpus=0)
class Worker:
    def work(self, call: int) -> int:
        if call == 1 and ray.get_runtime_context().get_assigned_resources().get("node2"):
            time.sleep(3600)  # the line its stack must show
        time.sleep(0.2)
        return call


if __name__ == "__main__":
    ray.init()
    here = Worker.options(resources={"head": 0.01}).remote()
    there = Worker.options(resources={"node2": 0.01}).remote()
    for call in range(3):
        ray.get([here.work.remote(call), there.work.remote(call)])
        print("CALL", call, flush=True)
