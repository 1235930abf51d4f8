"""A plain Ray job, unmodified by gkd: 8 actors, all alive and each in its ``wait`` at the line its stack must
show, of which the last 4 have not reported to the run. A worker that has not said who it is yet (its process
still starting, its name not yet read) is alive in Ray's view and absent from the run's state; here that lasts
(their ``GKD_REPORT`` is "0", as the watch's own helper actor has it), so a bug report taken at any moment finds
them so. Prints ``ALIVE`` and the 8 pids once every actor is up."""

import os
import time

import ray

UNREPORTED = range(4, 8)


@ray.remote(num_cpus=0.1)
class Sleeper:
    def __init__(self, i: int):
        self.i = i

    def pid(self) -> int:
        return os.getpid()

    def wait(self) -> int:
        time.sleep(3600)  # the line its stack must show
        return self.i


if __name__ == "__main__":
    ray.init(num_cpus=4)  # with its dashboard, as a new user has it: Ray's state API answers through it
    quiet = {"runtime_env": {"env_vars": {"GKD_REPORT": "0"}}}
    sleepers = [Sleeper.options(**(quiet if i in UNREPORTED else {})).remote(i) for i in range(8)]
    pids = ray.get([s.pid.remote() for s in sleepers], timeout=300)
    waits = [s.wait.remote() for s in sleepers]
    print("ALIVE", *pids, flush=True)
    ray.get(waits, timeout=3600)
