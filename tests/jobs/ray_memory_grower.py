"""A plain Ray job whose one actor grows ``GROW_MB`` megabytes a second until something stops it (the OOM
killer, in a memory cgroup), while a second actor stays flat and big: the growth is the grower's alone.

    python tests/jobs/ray_memory_grower.py [GROW_MB]
"""

import sys
import time

import ray

MB = 1 << 20


@ray.remote(num_cpus=0)
class Grower:
    def __init__(self):
        self.held: list[bytearray] = []

    def grow(self, mb_a_second: int) -> int:
        while True:
            block = bytearray(mb_a_second * MB)
            block[::4096] = b"x" * len(block[::4096])  # touched: resident, not just reserved
            self.held.append(block)
            time.sleep(1.0)


@ray.remote(num_cpus=0)
class Flat:
    def __init__(self):
        self.held = bytearray(200 * MB)
        self.held[::4096] = b"x" * len(self.held[::4096])

    def idle(self, seconds: float) -> int:
        time.sleep(seconds)
        return len(self.held)


def main() -> int:
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    ray.init(num_cpus=2, include_dashboard=False)
    grower, flat = Grower.remote(), Flat.remote()
    ray.get(flat.idle.remote(0), timeout=120)
    print("GROWING", flush=True)
    flat.idle.remote(3600)
    ray.get(grower.grow.remote(mb), timeout=900)  # raises once the grower is killed
    return 0


if __name__ == "__main__":
    sys.exit(main())
