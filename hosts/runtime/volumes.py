"""Volumes whose size the host enforces: a btrfs filesystem image of that size, loop-mounted
under a directory the platform owns on the host, given to Docker as a named local volume.

A container that writes past the size gets "No space left on device" from the kernel, not a
bill. btrfs rather than ext4 because it grows and shrinks while mounted and in use with
CAP_SYS_ADMIN alone (ext4's online resize also needs CAP_SYS_RESOURCE, which containers and
some hosts' root lack), and refuses by itself a shrink below what is stored. The renter names
a volume by its id; the host path is the platform's alone (made from the volume's name,
checked as a container reference), so no renter text reaches a path or a shell: each script
below is fixed text, its values are positional arguments.

Created, resized and removed over the pooled SSH connection; each script is idempotent so a
retried request finishes what a lost one began.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hosts import ssh
from hosts.runtime.container_spec import CONTAINER_REF, PLATFORM_LABEL, InvalidContainerSpec

if TYPE_CHECKING:
    from hosts.models import Machine

# Where the images and their mount points live on a host (root's, like Docker's own data).
VOLUME_DIR = "/var/lib/gpumkt/volumes"
MAX_VOLUME_GB = 100_000

# $1 directory, $2 name, $3 size in GB. The image is sparse: it takes what is written.
_CREATE = f"""set -e
d=$1; n=$2; img="$d/$n.img"; mnt="$d/$n"
mkdir -p "$mnt"
if [ ! -e "$img" ]; then
  truncate -s "$3G" "$img.new"
  mkfs.btrfs -q -f "$img.new" >/dev/null
  mv "$img.new" "$img"
fi
mountpoint -q "$mnt" || mount -o loop,nosuid,nodev "$img" "$mnt"
docker volume inspect "$n" >/dev/null 2>&1 || docker volume create --driver local \\
  --opt type=none --opt o=bind --opt device="$mnt" --label {PLATFORM_LABEL}=1 "$n" >/dev/null
"""

# $1 directory, $2 name, $3 new size in GB, online. Growing: the image, then the loop device
# learns its size, then the filesystem takes it. Shrinking: the filesystem first (btrfs moves
# what is stored below the new end, or refuses when it does not fit), then the image.
_RESIZE = """set -e
d=$1; n=$2; img="$d/$n.img"; mnt="$d/$n"
dev=$(losetup -n -O NAME -j "$img" | head -n 1)
[ -n "$dev" ] || { echo "volume $n is not mounted" >&2; exit 3; }
old=$(stat -c %s "$img"); new=$(($3 * 1073741824))
if [ "$new" -ge "$old" ]; then
  truncate -s "$new" "$img"; losetup -c "$dev"; btrfs filesystem resize max "$mnt" >/dev/null
else
  btrfs filesystem resize "$new" "$mnt" >/dev/null; truncate -s "$new" "$img"; losetup -c "$dev"
fi
"""

# $1 directory, $2 name: before a container that mounts it starts. A host rebooted since has
# lost the loop mount (Docker would bind the empty directory beneath, with no size limit). A
# volume Docker does not know fails, never leaving Docker to make a plain, unlimited one; a
# plain Docker volume of the platform's (no image of ours) is left as it is.
_ENSURE_MOUNTED = """set -e
d=$1; n=$2; img="$d/$n.img"; mnt="$d/$n"
docker volume inspect "$n" >/dev/null 2>&1 || { echo "volume $n is missing on this host" >&2; exit 3; }
[ -e "$img" ] || exit 0
mountpoint -q "$mnt" || mount -o loop,nosuid,nodev "$img" "$mnt"
"""

# $1 directory, $2 name.
_REMOVE = """d=$1; n=$2; img="$d/$n.img"; mnt="$d/$n"
docker volume rm --force "$n" >/dev/null 2>&1
if mountpoint -q "$mnt"; then umount "$mnt" || exit 1; fi
rm -f "$img" "$img.new"; rmdir "$mnt" 2>/dev/null
exit 0
"""

# $1 directory, $2 the volume copied, $3 its clone (both mounted, the clone at least as big):
# files, links, owners, modes and times, as they are now.
_COPY = """set -e
d=$1
for n in "$2" "$3"; do
  mountpoint -q "$d/$n" || { echo "volume $n is not mounted" >&2; exit 3; }
done
cp -a "$d/$2/." "$d/$3/"
"""

# $1 directory, $2 name: "<used KiB> <size KiB>" of the mounted filesystem (synced first:
# btrfs counts what is still in memory only once it is written out).
_USAGE = """d=$1; n=$2
sync -f "$d/$n" && df -P -k "$d/$n" | awk 'NR==2 {print $3, $2}'
"""


@dataclass(frozen=True)
class VolumeUsage:
    used_bytes: int
    size_bytes: int


def _name(name: str) -> str:
    if not CONTAINER_REF.fullmatch(name or ""):
        raise InvalidContainerSpec("volume", f"'{str(name)[:40]}' is not a volume name")
    return name


def _size(size_gb: int) -> str:
    if (
        not isinstance(size_gb, int)
        or isinstance(size_gb, bool)
        or not 1 <= size_gb <= MAX_VOLUME_GB
    ):
        raise InvalidContainerSpec("size_gb", f"a whole number of GB from 1 to {MAX_VOLUME_GB}")
    return str(size_gb)


class HostVolumes:
    """The enforced-size volumes on one machine, over the pooled SSH connection."""

    def __init__(self, machine: Machine, directory: str = VOLUME_DIR):
        self.machine = machine
        self.directory = directory

    def _script(self, script: str, *args: str, timeout: float = 120):
        argv = ["sh", "-c", script, "sh", self.directory, *args]
        return ssh.run(self.machine, argv, timeout=timeout)

    def create(self, name: str, size_gb: int) -> None:
        self._script(_CREATE, _name(name), _size(size_gb))

    def resize(self, name: str, size_gb: int) -> None:
        """Grow or shrink to ``size_gb`` while mounted (the caller checked what is stored)."""
        self._script(_RESIZE, _name(name), _size(size_gb))

    def ensure_mounted(self, name: str) -> None:
        self._script(_ENSURE_MOUNTED, _name(name), timeout=60)

    def copy(self, source: str, clone: str) -> None:
        """Copy what ``source`` stores into ``clone`` (both on this machine; an hour at most)."""
        self.ensure_mounted(source)  # a host rebooted since has lost its loop mount
        self._script(_COPY, _name(source), _name(clone), timeout=3600)

    def remove(self, name: str) -> None:
        self._script(_REMOVE, _name(name))

    def usage(self, name: str) -> VolumeUsage:
        out = self._script(_USAGE, _name(name), timeout=30).stdout.split()
        if len(out) != 2 or not all(part.isdigit() for part in out):
            raise ssh.CommandFailed(["df"], 1, f"volume {name}: df printed {out!r}")
        return VolumeUsage(used_bytes=int(out[0]) * 1024, size_bytes=int(out[1]) * 1024)
