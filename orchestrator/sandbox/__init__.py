"""The local sandbox cluster: Debian 12 containers with systemd and sshd that stand in for
servers."""
