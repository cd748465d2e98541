"""docker run argv: exactly as expected, or a clear error naming the field. Never a shell."""

from __future__ import annotations

import shlex

import pytest

from hosts.runtime import (
    ContainerSpec,
    InvalidContainerSpec,
    docker_run_argv,
    image_reference,
    image_repository,
)
from hosts.runtime.container_spec import RENTAL_CAPABILITIES, validate_image

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
            gpu_uuids=["GPU-aaaaaaaa-1111-2222-3333-444444444444", "GPU-bbbbbbbb-2222-3333-4444-555555555555"], entrypoint="/bin/sh", args=["-c", "echo hi"],
        ),
        machine_id=7,
        nvidia_runtime=True,
    )  # fmt: skip
    assert argv == [
        "docker", "run", "--detach", "--name", "gpumkt-abc", "--restart", "no",
        "--label", "gpumkt.instance=u-1", "--label", "gpumkt.machine=7", "--label", "gpumkt.platform=1",
        "--cpus", "4", "--cpu-shares", "4096", "--memory", "8192m", "--memory-swap", "8192m",
        "--memory-reservation", "6553m", "--shm-size", "4096m",
        "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
        "--cap-add", "AUDIT_WRITE", "--cap-add", "CHOWN", "--cap-add", "DAC_OVERRIDE",
        "--cap-add", "FOWNER", "--cap-add", "FSETID", "--cap-add", "KILL",
        "--cap-add", "NET_BIND_SERVICE", "--cap-add", "SETGID", "--cap-add", "SETUID",
        "--cap-add", "SYS_CHROOT", "--sysctl", "net.ipv4.ping_group_range=1 0",
        "--pids-limit", "4096",
        "--network", "gpumkt-tenants", "--log-driver", "json-file",
        "--log-opt", "max-size=10240k", "--log-opt", "max-file=3",
        "--gpus", '"device=GPU-aaaaaaaa-1111-2222-3333-444444444444,GPU-bbbbbbbb-2222-3333-4444-555555555555"',
        "--env", "A=1", "--publish", "20001:22/tcp", "--entrypoint", "/bin/sh",
        "pytorch/pytorch:2.3.0", "-c", "echo hi",
    ]  # fmt: skip


def test_a_rental_has_no_raw_sockets_and_no_swap_beyond_its_memory():
    argv = docker_run_argv(spec(memory_mb=3000, shm_mb=1000), machine_id=1, nvidia_runtime=False)
    options = argv[: argv.index(spec().image)]
    assert options[options.index("--cap-drop") + 1] == "ALL"
    added = {options[i + 1] for i, a in enumerate(options) if a == "--cap-add"}
    assert "NET_RAW" not in added and not {"SYS_ADMIN", "NET_ADMIN", "MKNOD"} & added
    # sshd in an SSH-mode image still has what it needs to log a renter in.
    assert {"SETUID", "SETGID", "SYS_CHROOT", "CHOWN"} <= added
    assert options[options.index("--memory") + 1] == "3000m"
    assert options[options.index("--memory-swap") + 1] == "3000m"


def test_without_the_nvidia_runtime_gpus_go_in_nvidia_visible_devices():
    argv = docker_run_argv(
        spec(gpu_uuids=["GPU-aaaaaaaa-1111-2222-3333-444444444444"]),
        machine_id=1,
        nvidia_runtime=False,
    )
    assert "--gpus" not in argv
    assert (
        argv[argv.index("NVIDIA_VISIBLE_DEVICES=GPU-aaaaaaaa-1111-2222-3333-444444444444") - 1]
        == "--env"
    )


def test_renter_nvidia_variables_are_dropped():
    argv = docker_run_argv(
        spec(
            env={"NVIDIA_VISIBLE_DEVICES": "all", "nvidia_driver_capabilities": "all", "OK": "1"},
            gpu_uuids=["GPU-aaaaaaaa-1111-2222-3333-444444444444"],
        ),
        machine_id=1,
        nvidia_runtime=False,
    )
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]
    assert envs == ["NVIDIA_VISIBLE_DEVICES=GPU-aaaaaaaa-1111-2222-3333-444444444444", "OK=1"]


@pytest.mark.parametrize("value", NASTY)
def test_nasty_values_in_env_and_args_stay_single_quoted_argv_elements(value):
    # Newlines are allowed in values and args: each stays one quoted element.
    argv = docker_run_argv(spec(env={"V": value}, args=[value]), machine_id=1, nvidia_runtime=False)
    assert f"V={value}" in argv and argv[-1] == value
    command = shlex.join(argv)
    assert shlex.split(command) == argv  # the remote shell sees exactly these words
    # The one network is the platform's tenants' bridge, never one the input could name.
    options = argv[: argv.index(spec().image)]
    assert [options[i + 1] for i, a in enumerate(options) if a.startswith("--net")] == [
        "gpumkt-tenants"
    ]
    for flag in (
        "--privileged",
        "--net=host",
        "--network=host",
        "--volume",
        "-v",
        "--mount",
        "--pid",
        "--ipc",
        "--device",
    ):
        assert flag not in argv[: argv.index(spec().image)], flag
    added = [options[i + 1] for i, a in enumerate(options) if a == "--cap-add"]
    assert added == list(RENTAL_CAPABILITIES)


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


@pytest.mark.parametrize(
    "uuid",
    [
        "all",
        "0",
        "GPU-x; rm",
        "--privileged",
        "GPU-aaaaaaaa-1111",
        "GPU-aaaaaaaa-1111-2222-3333-44444444444g",
    ],
)
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


# Every field of a spec, fed the same hostile values: each is either rejected naming that
# field, or reaches the argv as exactly one element, in its place, never as a docker option.
HOSTILE = [*NASTY, "ok\n", "\nok", "-v /:/h", "--network=host", "/var/run/docker.sock", "\0"]
STRICT_TEXT_FIELDS = ["name", "image", "entrypoint"]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("field", STRICT_TEXT_FIELDS)
def test_hostile_text_in_strict_fields_is_rejected(field, value):
    if field == "entrypoint" and value == "/var/run/docker.sock":
        # A path inside the container (the socket is never mounted): a valid program path,
        # and it stays the one element after --entrypoint.
        argv = docker_run_argv(spec(entrypoint=value), machine_id=1, nvidia_runtime=False)
        assert argv[argv.index("--entrypoint") + 1] == value
        return
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(**{field: value})
    assert caught.value.field == field


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_label_values_are_one_element_or_rejected(value):
    try:
        made = spec(labels={"gpumkt.note": value})
    except InvalidContainerSpec as error:
        assert error.field == "labels"
        assert any(c in value for c in "\n\r\0")  # only line breaks and NUL are refused
        return
    argv = docker_run_argv(made, machine_id=1, nvidia_runtime=True)
    assert argv[argv.index(f"gpumkt.note={value}") - 1] == "--label"
    assert shlex.split(shlex.join(argv)) == argv


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_env_keys_gpu_uuids_and_label_keys_are_rejected(value):
    for field, overrides in [
        ("env", {"env": {value: "1"}}),
        ("gpu_uuids", {"gpu_uuids": [value]}),
        ("gpu_uuids", {"gpu_uuids": ["GPU-aaaaaaaa-1111-2222-3333-444444444444" + value]}),
        ("labels", {"labels": {value: "1"}}),
        ("ports", {"ports": [(22, 20000, value)]}),
    ]:
        with pytest.raises(InvalidContainerSpec) as caught:
            spec(**overrides)
        assert caught.value.field == field, (field, value)


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_env_values_and_args_stay_exactly_one_element(value):
    if "\0" in value:
        with pytest.raises(InvalidContainerSpec):
            spec(env={"V": value})
        return
    argv = docker_run_argv(
        spec(env={"V": value}, args=[value, "x"]), machine_id=1, nvidia_runtime=False
    )
    image_at = argv.index("pytorch/pytorch:2.3.0")
    assert argv[image_at + 1 :] == [value, "x"]
    assert argv[argv.index(f"V={value}") - 1] == "--env"
    assert shlex.split(shlex.join(argv)) == argv


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cpus", "4; reboot"), ("cpus", True), ("cpus", float("nan")), ("cpus", -1),
        ("memory_mb", "8192m"), ("memory_mb", 8192.5), ("memory_mb", True),
        ("shm_mb", "64m"), ("shm_mb", None),
        ("disk_gb", "10 --privileged"), ("disk_gb", 0),
        ("name", 42), ("image", None), ("entrypoint", ["sh"]),
        ("env", [("A", "1")]), ("env", {"A": 1}), ("labels", {"a": 1}), ("labels", "a=b"),
        ("ports", [(22, 20000)]), ("ports", "22:20000"), ("ports", [(True, 20000, "tcp")]),
        ("gpu_uuids", "GPU-aaaaaaaa-1111-2222-3333-444444444444"), ("gpu_uuids", [None]),
        ("args", "--privileged"), ("args", [1]),
    ],
)  # fmt: skip
def test_values_of_the_wrong_kind_are_rejected_naming_the_field(field, value):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(**{field: value})
    assert caught.value.field == field


def test_disk_share_is_recorded_as_a_label():
    argv = docker_run_argv(spec(disk_gb=90), machine_id=3, nvidia_runtime=False)
    assert argv[argv.index("gpumkt.disk_gb=90") - 1] == "--label"


def test_renter_labels_cannot_impersonate_the_platform_labels():
    argv = docker_run_argv(
        spec(labels={"gpumkt.machine": "99", "gpumkt.platform": "0"}), machine_id=3,
        nvidia_runtime=False,
    )  # fmt: skip
    labels = [argv[i + 1] for i, a in enumerate(argv) if a == "--label"]
    assert labels == ["gpumkt.machine=3", "gpumkt.platform=1"]


# --- volumes: named volumes only, at a plain absolute path ---------------------------------


def test_volumes_are_named_volumes_mounted_by_type():
    argv = docker_run_argv(
        spec(volumes=[("gpumkt-data-1", "/workspace"), ("cache_2", "/root/.cache")]),
        machine_id=1,
        nvidia_runtime=False,
    )
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "--mount"]
    assert mounts == [
        "type=volume,source=gpumkt-data-1,target=/workspace",
        "type=volume,source=cache_2,target=/root/.cache",
    ]
    assert "--volume" not in argv and "-v" not in argv
    assert argv.index("--mount") < argv.index("pytorch/pytorch:2.3.0")


@pytest.mark.parametrize("value", [*HOSTILE, "/", "/etc", "host/path", "/:/h", "a,b", "a=b", ""])
def test_hostile_volume_sources_are_rejected(value):
    """A source with a slash would be a host path (a bind mount); commas or '=' would be
    more --mount options."""
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(volumes=[(value, "/workspace")])
    assert caught.value.field == "volumes"


@pytest.mark.parametrize(
    "target",
    [
        *[value for value in HOSTILE if value != "/var/run/docker.sock"],
        "/", "workspace", "/a/../etc", "/a/./b", "/data,readonly=false", "/data,src=/",
        "/x=y", "/a b", "//", "/data/", "/proc", "/proc/1", "/sys/fs", "/dev/sda", "/etc",
        "/usr/bin", "/" + "a" * 300,
    ],
)  # fmt: skip
def test_bad_mount_targets_are_rejected_naming_the_field(target):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(volumes=[("data", target)])
    assert caught.value.field == "volumes"


def test_a_named_volume_at_the_docker_socket_path_is_only_a_volume():
    """The path exists only inside the container: the host's socket is never the source."""
    argv = docker_run_argv(
        spec(volumes=[("data", "/var/run/docker.sock")]), machine_id=1, nvidia_runtime=False
    )
    assert "type=volume,source=data,target=/var/run/docker.sock" in argv
    assert not any("source=/" in a for a in argv)


@pytest.mark.parametrize(
    "volumes",
    [
        "data:/workspace", [("data",)], [("data", "/a", "rw")], [("a", "/w"), ("b", "/w")],
        [(f"v{i}", f"/v{i}") for i in range(9)], [(1, "/w")], [("data", 1)],
    ],
)  # fmt: skip
def test_malformed_volume_lists_are_rejected(volumes):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(volumes=volumes)
    assert caught.value.field == "volumes"


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("busybox", "docker.io/library/busybox"),
        ("pytorch/pytorch:2.3.0", "docker.io/pytorch/pytorch"),
        ("docker.io/pytorch/pytorch@sha256:" + "a" * 64, "docker.io/pytorch/pytorch"),
        ("127.0.0.1:5000/team/private:1", "127.0.0.1:5000/team/private"),
        ("ghcr.io/org/img:tag@sha256:" + "b" * 64, "ghcr.io/org/img"),
        ("localhost/x", "localhost/x"),
        ("index.docker.io/user/private:1", "docker.io/user/private"),
    ],
)
def test_an_image_names_its_repository_whatever_tag_or_digest(image, repository):
    """Any tag or digest of a repository counts as that repository (a cached private image
    must not run under another name for it)."""
    assert image_repository(image) == repository


@pytest.mark.parametrize(
    ("image", "given"),
    [
        ("busybox", "busybox:latest"),
        ("3f2a", "3f2a:latest"),  # never an image ID prefix
        ("127.0.0.1:5000/team/x", "127.0.0.1:5000/team/x:latest"),
        ("pytorch/pytorch:2.3.0", "pytorch/pytorch:2.3.0"),
        ("busybox@sha256:" + "c" * 64, "busybox@sha256:" + "c" * 64),
    ],
)
def test_docker_run_is_given_the_image_with_a_tag(image, given):
    assert image_reference(image) == given
    argv = docker_run_argv(spec(image=image), machine_id=1, nvidia_runtime=False)
    assert given in argv and argv.index(given) == len(argv) - 1  # no args: the image is last


@pytest.mark.parametrize(
    "network",
    ["host", "bridge", "none", "container:gpumkt-abc", "gpumkt", "--network=host", "Gpumkt-x", ""],
)
def test_only_the_platforms_own_networks_can_be_joined(network):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(network=network)
    assert caught.value.field == "network"


def test_a_group_network_is_joined_by_name():
    argv = docker_run_argv(spec(network="gpumkt-group-7"), machine_id=1, nvidia_runtime=False)
    assert argv[argv.index("--network") + 1] == "gpumkt-group-7"


@pytest.mark.parametrize(
    ("field", "value"),
    [("log_max_kb", 0), ("log_max_kb", 10**9), ("log_max_files", 0), ("log_max_files", "3")],
)
def test_log_caps_are_sane(field, value):
    with pytest.raises(InvalidContainerSpec) as caught:
        spec(**{field: value})
    assert caught.value.field == field


SLICE_CARD = "GPU-6f0d2a52-6c1e-4c57-9a51-9b7c3f1d2e80"


def test_a_slice_gets_its_mps_limits_and_the_daemons_pipes_read_only_and_nothing_else():
    from hosts.runtime import GpuSliceSpec

    argv = docker_run_argv(
        spec(
            gpu_uuids=[SLICE_CARD],
            gpu_slice=GpuSliceSpec(core_percent=25, memory_mb=8192),
            env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "Cuda_Mps_Pipe_Directory": "/x"},
        ),
        machine_id=7,
        nvidia_runtime=True,
    )
    envs = [argv[i + 1] for i, flag in enumerate(argv) if flag == "--env"]
    assert envs == [
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M",
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
    ]
    mounts = [argv[i + 1] for i, flag in enumerate(argv) if flag == "--mount"]
    assert mounts == ["type=bind,source=/run/gpumkt-mps/pipe,target=/tmp/nvidia-mps,readonly"]
    assert argv[argv.index("--gpus") + 1] == f'"device={SLICE_CARD}"'
    # A whole-GPU container never gets them.
    whole = docker_run_argv(spec(gpu_uuids=[SLICE_CARD]), machine_id=7, nvidia_runtime=True)
    assert "--mount" not in whole and not any("CUDA_MPS" in arg for arg in whole)


@pytest.mark.parametrize(
    "gpus, core, memory, field",
    [
        ([SLICE_CARD, SLICE_CARD.replace("6f", "7f")], 25, 100, "gpu_slice"),
        ([SLICE_CARD], 0, 100, "gpu_slice.core_percent"),
        ([SLICE_CARD], 101, 100, "gpu_slice.core_percent"),
        ([SLICE_CARD], 50, 0, "gpu_slice.memory_mb"),
    ],
)
def test_a_slice_spec_is_one_card_and_sane_sizes(gpus, core, memory, field):
    from hosts.runtime import GpuSliceSpec

    with pytest.raises(InvalidContainerSpec) as refused:
        spec(gpu_uuids=gpus, gpu_slice=GpuSliceSpec(core_percent=core, memory_mb=memory))
    assert refused.value.field == field


def test_the_disk_is_capped_only_where_the_host_enforces_it():
    from hosts.runtime.container_spec import ContainerSpec, docker_run_argv

    spec = {"name": "c", "image": "busybox:1", "cpus": 1.0, "memory_mb": 512, "shm_mb": 64,
            "disk_gb": 7}  # fmt: skip
    capped = docker_run_argv(ContainerSpec(**spec, disk_enforced=True), machine_id=1,
                             nvidia_runtime=False)  # fmt: skip
    assert capped[capped.index("--storage-opt") + 1] == "size=7G"
    assert "gpumkt.disk_gb=7" in capped
    plain = docker_run_argv(ContainerSpec(**spec), machine_id=1, nvidia_runtime=False)
    assert "--storage-opt" not in plain and "gpumkt.disk_gb=7" in plain


@pytest.mark.parametrize("image", ["sha256:" + "0" * 64, "sha256:abc"])
def test_an_image_id_is_refused_as_an_image(image):
    """Docker runs a local image by its id or a prefix of it (``docker run sha256:<id>``
    runs on this engine), past the checks a name gets."""
    with pytest.raises(InvalidContainerSpec) as caught:
        validate_image(image)
    assert caught.value.field == "image" and "image id" in str(caught.value)


@pytest.mark.parametrize("image", ["abcdef", "abcdef:latest", "deadbeef/app"])
def test_hex_names_are_names(image):
    """Given a tag by docker_run_argv (``abcdef:latest``), Docker reads them as names."""
    validate_image(image)
