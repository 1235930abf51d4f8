"""A plain Ray job whose worker groups never start: one placement group no node can ever host
(bundles of 10 CPUs on a 4-CPU node, verl's RayResourcePool default), and one that waits for the
CPUs a group of its own already holds."""

import sys

import ray
from ray.util.placement_group import placement_group

if __name__ == "__main__":
    ray.init(num_cpus=4, include_dashboard="--dashboard" in sys.argv)
    holder = placement_group([{"CPU": 3}], name="holder")
    ray.get(holder.ready(), timeout=60)
    never = placement_group([{"CPU": 10}] * 2, name="global_pool")
    busy = placement_group([{"CPU": 2}], name="busy_pool")
    print("pools asked", flush=True)
    ready, _ = ray.wait([never.ready(), busy.ready()], num_returns=2, timeout=3600)
