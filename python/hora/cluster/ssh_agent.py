"""What mpirun runs instead of ssh: ``python -m hora.cluster.ssh_agent HOST COMMAND...``.

HOST is one of the pseudonyms the driver gave mpirun for the task hosts. The
agent asks the driver which task service stands for it, hands that service
the command (mpirun's daemon) and relays its output and exit code, as ssh
would. Killing the agent kills the daemon.
"""
import os
import signal
import sys

from hora.cluster import channel


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # ssh options mpirun may put before the host (none with hora's settings)
    while argv and argv[0].startswith("-"):
        argv = argv[1:]
    if len(argv) < 2:
        print("usage: python -m hora.cluster.ssh_agent HOST COMMAND...", file=sys.stderr)
        return 255
    host, command = argv[0], " ".join(argv[1:])
    key = channel.key_from_env()
    try:
        with channel.connect(channel.driver_from_env(), key) as driver:
            driver.send(("task_address", host))
            reply = driver.recv()
    except (OSError, EOFError) as exc:
        print(f"hora ssh agent: cannot reach the driver for host {host}: {exc}",
              file=sys.stderr)
        return 255
    if reply[0] != "ok":
        print(f"hora ssh agent: {reply[1]}", file=sys.stderr)
        return 255
    address = reply[1]
    # mpirun stops its agents with SIGTERM; leave through the normal path so
    # that the connection closes and the task service kills the daemon.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(255))
    try:
        with channel.connect(address, key) as task:
            task.send(("exec", command))
            outputs = {1: sys.stdout.buffer, 2: sys.stderr.buffer}
            while True:
                message = task.recv()
                if message[0] == "out":
                    outputs[message[1]].write(message[2])
                    outputs[message[1]].flush()
                elif message[0] == "exit":
                    return message[1]
                else:
                    print(f"hora ssh agent: {message[1]}", file=sys.stderr)
                    return 255
    except (OSError, EOFError) as exc:
        print(f"hora ssh agent: lost the task service of host {host} "
              f"({channel.format_address(address)}): {exc or 'connection closed'}; the Spark "
              "task or Ray actor that hosts it has ended",
              file=sys.stderr)
        return 255


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
