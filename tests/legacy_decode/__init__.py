"""The model's decode step as it was before issue #16 item 4 (commit 3af3bde): ``core/model``'s layer files
copied unchanged but for their imports (``dsahal.*`` instead of relative ones) and the short convolution's
custom op name. tests/test_model_decode_launches.py runs it beside the current model on the same weights
and cache: the launch reductions must leave the decode step's logits and tokens as they were."""
