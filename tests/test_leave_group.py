"""A run leaves its process group at the end, so the group's threads stop before the interpreter does."""

import subprocess
import sys
import textwrap


def test_a_rank_leaves_its_process_group():
    # in a fresh interpreter: joining a group here would leave it joined for the other tests of this worker
    code = textwrap.dedent("""
        import torch.distributed as dist
        from tunekit.placement.dist import leave_group
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        assert dist.is_initialized()
        leave_group()
        assert not dist.is_initialized()
        leave_group()  # without a group: nothing to do
        print("left")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "left", out.stderr[-2000:]
