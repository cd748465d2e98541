"""docker run argv: exactly as expected, or a clear error naming the field. Never a shell."""

from __future__ import annotations

import shlex

import pytest

from hosts.runtime import ContainerSpec, InvalidContainerSpec, docker_run_argv

NASTY = [
    "$(reboot)",
    "`id`",
    "a; rm -rf /",
    "x\ny",
    "--privileged",
    "-v /:/h",
    "a|b",
    "'\"",
    "${IFS}",
]


def spec(**overrides) -> ContainerSpec:
    values = {
        "name": "gpumkt-abc",
        "image": "pytorch/pytorch:2.3.0",
        "cpus": 4.0,
        "memory_mb": 8192,
        "shm_mb": 4096,
    }
    values.update(overrides)
    return ContainerSpec(**values)


def test_argv_is_exactly_the_expected_one():
    argv = docker_run_argv(
        spec(
            labels={"gpumkt.instance": "u-1"}, env={"A": "1"}, ports=[(22, 20001, "tcp")],
            gpu_uuids=["GPU-aaaaaaaa-1111", "GPU-bbbbbbbb-2222"], entrypoint="/bin/sh", args=["-c", "echo hi"],
        ),
        machine_id=7,
        nvidia_runtime=True,
    )  # fmt: skip
    assert argv == [
        "docker", "run", "--detach", "--name", "gpumkt-abc", "--restart", "no",
        "--label", "gpumkt.instance=u-1", "--label", "gpumkt.machine=7", "--label", "gpumkt.platform=1",
        "--cpus", "4", "--memory", "8192m", "--memory-reservation", "6553m", "--shm-size", "4096m",
        "--security-opt", "no-new-privileges", "--pids-limit", "4096",
        "--gpus", '"device=GPU-aaaaaaaa-1111,GPU-bbbbbbbb-2222"',
        "--env", "A=1", "--publish", "20001:22/tcp", "--entrypoint", "/bin/sh",
        "pytorch/pytorch:2.3.0", "-c", "echo hi",
    ]  # fmt: skip


def test_without_the_nvidia_runtime_gpus_go_in_nvidia_visible_devices():
    argv = docker_run_argv(
        spec(gpu_uuids=["GPU-aaaaaaaa-1111"]), machine_id=1, nvidia_runtime=False
    )
    assert "--gpus" not in argv
    assert argv[argv.index("NVIDIA_VISIBLE_DEVICES=GPU-aaaaaaaa-1111") - 1] == "--env"


def test_renter_nvidia_variables_are_dropped():
    argv = docker_run_argv(
        spec(
            env={"NVIDIA_VISIBLE_DEVICES": "all", "nvidia_driver_capabilities": "all", "OK": "1"},
            gpu_uuids=["GPU-aaaaaaaa-1111"],
        ),
        machine_id=1,
        nvidia_runtime=False,
    )
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]
    assert envs == ["NVIDIA_VISIBLE_DEVICES=GPU-aaaaaaaa-1111", "OK=1"]


@pytest.mark.parametrize("value", NASTY)
def test_nasty_values_in_env_and_args_stay_single_quoted_argv_elements(value):
    # Newlines are allowed in values and args: each stays one quoted element.
    argv = docker_run_argv(spec(env={"V": value}, args=[value]), machine_id=1, nvidia_runtime=False)
    assert f"V={value}" in argv and argv[-1] == value
    command = shlex.join(argv)
    assert shlex.split(command) == argv  # the remote shell sees exactly these words
    for flag in (
        "--privileged",
        "--network",
        "--volume",
        "-v",
        "--mount",
        "--pid",
        "--ipc",
        "--cap-add",
        "--device",
    ):
        assert flag not in argv[: argv.index(spec().image)], flag


@pytest.mark.parametrize("value", NASTY)
@pytest.mark.parametrize("field", ["image", "name", "entrypoint"])
def test_nasty_values_in_names_are_rejected_naming_the_field(field, value):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(**{field: value})
    assert caught.value.field == field


@pytest.mark.parametrize("key", ["A B", "1A", "A=B", "A;B", "$(x)", "", "--privileged"])
def test_bad_env_keys_are_rejected(key):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(env={key: "1"})
    assert caught.value.field == "env"


@pytest.mark.parametrize(
    "ports",
    [[(0, 20000, "tcp")], [(22, 70000, "tcp")], [(22, 20000, "sctp")], [("22", 20000, "tcp")]],
)
def test_bad_ports_are_rejected(ports):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(ports=ports)
    assert caught.value.field == "ports"


@pytest.mark.parametrize("label", ["a=b", "A", "x y", "-x"])
def test_bad_label_keys_are_rejected(label):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(labels={label: "v"})
    assert caught.value.field == "labels"


@pytest.mark.parametrize("uuid", ["all", "0", "GPU-x; rm", "--privileged"])
def test_gpu_uuids_must_be_uuids(uuid):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(gpu_uuids=[uuid])
    assert caught.value.field == "gpu_uuids"


@pytest.mark.parametrize(
    ("field", "value"),
    [("cpus", 0), ("cpus", 1e9), ("memory_mb", 1), ("shm_mb", 0), ("shm_mb", 9000)],
)
def test_resource_limits_are_sane(field, value):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(**{field: value})
    assert caught.value.field == field


def test_args_can_never_become_docker_options():
    argv = docker_run_argv(
        spec(args=["--privileged", "-v", "/:/h"]), machine_id=1, nvidia_runtime=False
    )
    image_at = argv.index("pytorch/pytorch:2.3.0")
    assert argv[image_at + 1 :] == [
        "--privileged",
        "-v",
        "/:/h",
    ]  # after the image: the container's argv
    assert "--privileged" not in argv[:image_at]
