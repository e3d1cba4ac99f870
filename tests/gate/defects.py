"""Sixteen security defects a pull request may add, each on one line of its own, and the clean changes
a gate must pass: what the analyzer tests plant in real git repositories."""

from __future__ import annotations

from pathlib import Path

# (file, the line's text, the rule ids that name it: any one of them counts)
DEFECTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("app/handlers.py", "    subprocess.run(f\"convert {name}\", shell=True)", ("ruff/S602", "bandit/B602")),
    ("app/handlers.py", "    obj = pickle.loads(blob)", ("ruff/S301", "bandit/B301")),
    ("app/handlers.py", "    cfg = yaml.load(blob)", ("ruff/S506", "bandit/B506")),
    ("app/handlers.py", "    conn.execute(f\"SELECT * FROM users WHERE name = '{name}'\")",
     ("ruff/S608", "bandit/B608")),
    ("app/handlers.py", "    requests.get(\"https://internal.example\", verify=False, timeout=5)",
     ("ruff/S501", "bandit/B501")),
    ("app/handlers.py", "    scratch = tempfile.mktemp()", ("ruff/S306", "bandit/B306")),
    ("app/handlers.py", "    stored = hashlib.md5(password.encode()).hexdigest()",
     ("ruff/S324", "bandit/B324")),
    ("app/handlers.py", "    valid = hmac.new(KEY, blob, \"sha256\").hexdigest() == signature",
     ("timing-unsafe-compare",)),
    ("app/handlers.py", "    os.system(f\"tar xf {name}\")", ("ruff/S605", "bandit/B605")),
    ("app/clients.py", "GITHUB_TOKEN = \"ghp_R8xq2LmVn4Tz7YwK1pHc9DsJ3fGb6NaE0uQi\"",
     ("detect-secrets/GitHubTokenDetector",)),
    ("app/clients.py", "SLACK_BOT = \"xoxb-2718281828-3141592653589-Gq7ZkPw2RmX9tLc4VnB8sHdJ\"",
     ("detect-secrets/SlackDetector",)),
    ("app/clients.py", "OPENAI_KEY = \"sk-proj-Qw3rTy7UiOp2AsDf5GhJT3BlbkFJZx8CvBn4MqWe1RtYu9Io\"",
     ("detect-secrets/OpenAIDetector",)),
    ("app/settings.py", "DB_PASSWORD = \"Tr0ub4dor-and-3-horses\"",
     ("detect-secrets/KeywordDetector", "ruff/S105")),
    ("deploy/id_rsa.pem", "-----BEGIN RSA PRIVATE KEY-----", ("detect-secrets/PrivateKeyDetector",)),
    ("config/settings.yaml", "  password: Zx9-prod-Qm4-secret", ("detect-secrets/KeywordDetector",)),
    ("config/settings.yaml", "aws_access_key_id: AKIAQ3EGRV7XKJ2M5TW4", ("detect-secrets/AWSKeyDetector",)),
)

HANDLERS_HEAD = """\"\"\"Request handlers.\"\"\"

import hashlib
import hmac
import os
import pickle
import subprocess
import tempfile

import requests
import yaml

KEY = os.environ.get("APP_KEY", "").encode()


def handle(conn, name, blob, password, signature):
"""
HANDLERS_TAIL = "    return obj, cfg, scratch, stored, valid\n"
OTHER = {
    "app/clients.py": "\"\"\"Clients of the services we call.\"\"\"\n\n",
    "app/settings.py": "\"\"\"Settings.\"\"\"\n\nDEBUG = False\n",
    "deploy/id_rsa.pem": "",
    "config/settings.yaml": "database:\n  host: db.internal\n",
}
PEM_TAIL = ("MIIEowIBAAKCAQEAvJ3kq9TnZ0y8M2Xn5cRr7Lw1dQp4sHf6Gt2Ua0Vb3Ne8Kj5Ym\n"
            "-----END RSA PRIVATE KEY-----\n")
BASE = {"app/__init__.py": "", "app/util.py": "def double(x: int) -> int:\n    return 2 * x\n",
        "tests/test_util.py": "from app.util import double\n\n\ndef test_double() -> None:\n"
                              "    assert double(2) == 4\n",
        "pyproject.toml": "[project]\nname = \"planted\"\nversion = \"0.1.0\"\n\n[tool.pytest.ini_options]\n"
                          "testpaths = [\"tests\"]\n"}


def planted_files() -> dict[str, str]:
    """The head's new files: every defect on its own line (the line numbers are those of :func:`where`)."""
    files = {path: text for path, text in OTHER.items()}
    files["app/handlers.py"] = HANDLERS_HEAD
    for path, line, _ in DEFECTS:
        files[path] += line + "\n"
    files["app/handlers.py"] += HANDLERS_TAIL
    files["deploy/id_rsa.pem"] += PEM_TAIL
    files["tests/test_handlers_exist.py"] = (
        "from pathlib import Path\n\n\ndef test_handlers_exist() -> None:\n"
        "    assert (Path(__file__).parents[1] / 'app' / 'handlers.py').is_file()\n")
    return files


def where() -> list[tuple[str, int, tuple[str, ...]]]:
    """Each defect's file, line number in the head, and rule ids."""
    files = planted_files()
    out = []
    for path, line, rules in DEFECTS:
        number = files[path].splitlines().index(line) + 1
        out.append((path, number, rules))
    return out


def plant(root: Path, files: dict[str, str] | None = None) -> None:
    for path, text in (files or planted_files()).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
