"""What the scripts that move artifacts print (hub_download.py, image_copy.py, image_pull.py): put before each of
them when it is sent to a node (components/remote/__init__.py's `with_progress`), since a script sent on stdin
imports nothing of ours. Sizes as preflight prints them (components/text.py)."""

SHOW_EVERY_S = 10  # how often a long transfer says where it is


def say(text):
    print(f"spark-vllm: {text}", flush=True)


def human(n):
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
