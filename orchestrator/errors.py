"""Errors the user can act on. Every message names the problem and the fix."""


class ClusterError(Exception):
    """Base class: the CLI prints the message and exits non-zero, without a traceback."""

    exit_code = 2


class SandboxError(ClusterError):
    """The local sandbox cluster could not be created, inspected or removed."""


class InventoryError(ClusterError):
    """The Ansible inventory does not describe a usable cluster."""


class PreflightError(ClusterError):
    """A node is not ready to run a job."""


class QueueLimitError(ClusterError):
    """A --queue request above a limit of Slurm's that no end of other jobs can lift."""


class LaunchError(ClusterError):
    """A job could not be started, or failed on a node."""

    exit_code = 1


class InputError(LaunchError):
    """Input wrong on its face (an option, a job or environment file, an argument): refused
    at the door, before any node is contacted, with exit 2."""

    exit_code = 2


class DiagnoseError(ClusterError):
    """A hung run's stack or flight-recorder dumps could not be read or analysed."""
