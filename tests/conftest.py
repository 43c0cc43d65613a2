import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# No test reaches a real Hub: a Hugging Face id missing from the caches is an offline error unless a
# test serves a Hub of its own on 127.0.0.1 (tests/hub_server.py) and says HF_HUB_OFFLINE=0.
os.environ["HF_HUB_OFFLINE"] = "1"
