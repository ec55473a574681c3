"""Property test of ``draftsmith train --set``: random settings raise nothing but
:class:`DraftsmithError`."""

from __future__ import annotations

import argparse
import json

from _inputs import SETTINGS, escapes_only_draftsmith_errors, json_values
from hypothesis import given
from hypothesis import strategies as st


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["lr", "steps", "max_len", "target_layer_ids",
                                           "family", "val_fraction", "seed", "x", ""]),
                          json_values.map(lambda v: json.dumps(v, default=str))), max_size=4))
def test_random_train_settings_raise_only_draftsmith_errors(items) -> None:
    from draftsmith.cli.train import _train_config

    args = argparse.Namespace(family="dspark-gqa", steps=None, init_from=None,
                              set=[f"{k}={v}" for k, v in items])
    escapes_only_draftsmith_errors(lambda: _train_config(args))
