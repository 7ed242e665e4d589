"""Build the sandbox node image without a registry: debootstrap, then `podman import`.

The image is tagged with a hash of its recipe and built only when no image with
that tag exists; a file lock keeps two concurrent `sandbox up` from building twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import SandboxError
from .layout import BASTION_TABLE, USERS
from .podman import podman, podman_env, require_podman

IMAGE_REPO = "localhost/clustertrain-node"
SUITE = "bookworm"
PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv",
    "python3-apt", "sudo", "iproute2", "rsync", "procps", "ca-certificates", "nftables",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def _login_users() -> str:
    """Shell that adds the login users (same uid/gid on every node), their ~/.ssh (the
    sandbox's public key is bind-mounted at ~/.ssh/authorized_keys) and, for those with
    sudo, a sudoers drop-in."""
    out = []
    for u in USERS:
        out.append(f"""groupadd --root "$R" -g {u.uid} {u.name}
useradd --root "$R" -u {u.uid} -g {u.uid} -m -s /bin/bash -p '*' {u.name}
chmod 0700 "$R/home/{u.name}"
install -d -m 0700 -o {u.uid} -g {u.uid} "$R/home/{u.name}/.ssh"
""")
        if u.sudo:   # an admin: also in the admin group (cluster_admin_group: sudo)
            out.append(f"""usermod --root "$R" -aG sudo {u.name}
echo '{u.name} ALL=(ALL:ALL) NOPASSWD: ALL' > "$R/etc/sudoers.d/{u.name}"
chmod 0440 "$R/etc/sudoers.d/{u.name}"
chroot "$R" visudo -cq -f /etc/sudoers.d/{u.name}
""")
    return "".join(out)


# Run inside the debootstrapped root before it is imported (bump the recipe hash
# by editing it: the text itself is hashed).
CUSTOMISE = r"""
set -eu
R="$1"
cat > "$R/etc/apt/sources.list" <<SRC
deb MIRROR bookworm main
deb MIRROR bookworm-updates main
deb SECURITY bookworm-security main
SRC
install -d -m 0700 "$R/root/.ssh"
# The site's own sshd policy: users log in with keys; root cannot log in at all.
cat > "$R/etc/ssh/sshd_config.d/10-sandbox-site.conf" <<'SSHD'
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
SSHD
""" + _login_users() + r"""
# Bastion mode (`sandbox up --bastion` writes /etc/sandbox-bastion.nft): a table of its
# own, loaded at boot and again whenever nftables.service loads a ruleset that flushes all.
cat > "$R/etc/systemd/system/sandbox-bastion.service" <<'UNIT'
[Unit]
Description=Sandbox bastion mode: no SSH from the host (nftables table inet BASTION_TABLE)
ConditionPathExists=/etc/sandbox-bastion.nft
DefaultDependencies=no
Wants=network-pre.target
Before=network-pre.target shutdown.target
After=nftables.service
PartOf=nftables.service
Conflicts=shutdown.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/nft -f /etc/sandbox-bastion.nft
ExecStop=-/usr/sbin/nft delete table inet BASTION_TABLE
[Install]
WantedBy=sysinit.target
UNIT
install -d "$R/etc/systemd/system/sysinit.target.wants" "$R/etc/systemd/system/nftables.service.d"
ln -sf /etc/systemd/system/sandbox-bastion.service \
  "$R/etc/systemd/system/sysinit.target.wants/sandbox-bastion.service"
# nftables.service's first start or a reload flushes the ruleset while the unit above stays
# active: load the table again right after it.
cat > "$R/etc/systemd/system/nftables.service.d/sandbox-bastion.conf" <<'UNIT'
[Service]
ExecStartPost=-/usr/sbin/nft -f /etc/sandbox-bastion.nft
ExecReload=-/usr/sbin/nft -f /etc/sandbox-bastion.nft
UNIT
# Every node gets its own SSH host keys on first boot, not the ones baked into the image.
rm -f "$R"/etc/ssh/ssh_host_*
cat > "$R/etc/systemd/system/ssh-hostkeys.service" <<'UNIT'
[Unit]
Description=Generate this node's SSH host keys
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A
[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/ssh-hostkeys.service \
  "$R/etc/systemd/system/multi-user.target.wants/ssh-hostkeys.service"
# Units that cannot work in a container and would leave systemd 'degraded'.
for u in systemd-remount-fs.service getty@tty1.service console-getty.service \
         systemd-firstboot.service sys-kernel-config.mount sys-kernel-debug.mount; do
  ln -sf /dev/null "$R/etc/systemd/system/$u"
done
: > "$R/etc/machine-id"
rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/*
""".replace("BASTION_TABLE", BASTION_TABLE)


@dataclass(frozen=True)
class ImageRecipe:
    mirror: str
    suite: str = SUITE
    packages: tuple[str, ...] = PACKAGES

    @property
    def security_mirror(self) -> str:
        return re.sub(r"/debian/?$", "/debian-security", self.mirror)

    def digest(self) -> str:
        # The mirror is not part of the recipe: the same packages come from any mirror.
        text = "\n".join([self.suite, " ".join(self.packages), CUSTOMISE])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{IMAGE_REPO}:{self.digest()}"


def host_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror the host's own apt uses (deb822 or one-line format)."""
    files = sorted(sources_dir.glob("sources.list.d/*.sources")) + \
        sorted(sources_dir.glob("sources.list.d/*.list")) + [sources_dir / "sources.list"]
    for f in files:
        if not f.is_file():
            continue
        for m in re.finditer(r"(?:URIs:|^deb)\s+(?:\[[^\]]*\]\s+)?(\S+)", f.read_text(), re.M):
            uri = m.group(1).rstrip("/")
            if uri.endswith("/debian"):
                return uri
    return DEFAULT_MIRROR


def image_exists(tag: str) -> bool:
    return podman(["image", "exists", tag], check=False).returncode == 0


def ensure_image(state_dir: Path, recipe: ImageRecipe | None = None,
                 log=print) -> str:
    """Return the tag of the node image, building it first if it is not cached."""
    recipe = recipe or ImageRecipe(mirror=host_mirror())
    require_podman()
    if image_exists(recipe.tag):
        return recipe.tag
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_exists(recipe.tag):  # built by someone else while we waited
            return recipe.tag
        _build(state_dir, recipe, log)
    return recipe.tag


def _step(name: str, cmd: list[str], **kw) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise SandboxError(f"building the sandbox node image failed at step '{name}' "
                           f"(exit {proc.returncode}):\n{tail}")


def _build(state_dir: Path, recipe: ImageRecipe, log) -> None:
    if shutil.which("debootstrap") is None:
        raise SandboxError(
            "debootstrap is not installed; the sandbox builds its node image with it.\n"
            "Install it with: sudo apt-get install -y debootstrap")
    log(f"building sandbox node image {recipe.tag} (debootstrap {recipe.suite}, "
        f"about a minute; cached afterwards)")
    with tempfile.TemporaryDirectory(dir=state_dir, prefix="image-build-") as tmp:
        root = Path(tmp) / "rootfs"
        _step("debootstrap", ["debootstrap", "--variant=minbase",
                              "--include=" + ",".join(recipe.packages),
                              recipe.suite, str(root), recipe.mirror])
        script = CUSTOMISE.replace("SECURITY", recipe.security_mirror) \
                          .replace("MIRROR", recipe.mirror)
        _step("customise", ["bash", "-c", script, "customise", str(root)])
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        _step("podman import",
              [require_podman(), "import", "--change", 'CMD ["/sbin/init"]', "-",
               recipe.tag], stdin=tar.stdout, env=podman_env())
        tar.wait()
