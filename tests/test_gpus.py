"""Device-map indices name the launcher's GPUs, as torch counts them under CUDA_VISIBLE_DEVICES."""

from tunekit.config import load_recipe
from tunekit.placement.gpus import launch_gpus, nvml_indices, physical_ids, visible_devices
from tunekit.runners import runner_for


def test_without_a_mask_indices_are_physical():
    assert launch_gpus({}) is None
    assert physical_ids([0, 3], {}) == ["0", "3"]
    assert nvml_indices([1], {}) == [1]


def test_a_launcher_mask_maps_indices_to_its_gpus():
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert visible_devices([1, 0], env) == "3,2"
    assert nvml_indices([0, 1], env) == [2, 3]


def test_the_recorded_launch_view_wins_over_a_narrowed_mask():
    env = {"CUDA_VISIBLE_DEVICES": "6", "TUNEKIT_LAUNCH_GPUS": "6,7"}
    assert visible_devices([1], env) == "7"


def test_uuid_ids_keep_the_index_for_nvml():
    assert nvml_indices([0], {"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == [0]


def test_probe_children_see_the_physical_gpus_of_their_map(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.delenv("TUNEKIT_LAUNCH_GPUS", raising=False)
    r = load_recipe(None, ["system.device_map={actor:[1],critic:[1],ref:[1],rollout:[1],reward:[1]}"])
    env = runner_for(r).env(r, None, on_gpu=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["TUNEKIT_LAUNCH_GPUS"] == "2,3"
