"""A plain Ray job that shuts Ray down and starts it again in one process, as verl's own tests do (a
fixture's ``ray.init`` and ``ray.shutdown`` around each test): its waits last long enough to be shown
(a placement group's ``ready``, calls of 0.3 s), so the watcher holds a shown wait across the shutdown.

    python ray_started_twice.py ROUNDS
"""

import sys
import time

import ray
from ray.util.placement_group import placement_group

WAIT_S = 60  # every wait of the job has a bound


@ray.remote(num_cpus=0)
class Slow:
    def echo(self, x: int) -> int:
        time.sleep(0.3)
        return x


def main(rounds: int) -> None:
    for r in range(rounds):
        ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
        ray.get(placement_group([{"CPU": 1}]).ready(), timeout=WAIT_S)
        actor = Slow.remote()
        for i in range(3):
            assert ray.get([actor.echo.remote(i), actor.echo.remote(i)], timeout=WAIT_S) == [i, i]
        del actor
        ray.shutdown()
        time.sleep(1.0)  # the watcher's next look comes while Ray is down
        print(f"round {r} done", flush=True)
    print("all rounds done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
