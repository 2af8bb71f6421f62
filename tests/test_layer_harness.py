"""Keras' own layer test harness on every public layer, on every backend.

`keras.src.testing.TestCase.run_layer_test` is how Keras tests its own layers
(`MultiHeadAttention` included): it instantiates the layer from its config,
builds it symbolically and eagerly, checks the output shapes and dtypes, the
weight counts, `get_config` / `from_config`, a `.keras` round trip, a
training step (`model.fit`) and the mixed-precision policies (here for the
blocks without attention; the attention-bearing layers' mixed precision:
`test_vit.py`'s mixed_bfloat16 ViT). Here it runs,
as Keras calls it, on PointwiseAttention (pointwise and softmax, gated,
learned scale), the position embedding, class / register tokens, the MLP and
encoder blocks, the MAP head and the image preprocessor.
"""

from keras.src import testing

import keras_reluvit as kr
from keras_reluvit.models.layers import MAPHead


class LayerHarness(testing.TestCase):
    def test_pointwise_attention(self):
        common = dict(input_shape={"query_shape": (2, 8, 16), "value_shape": (2, 4, 16)},
                      expected_output_shape=(2, 8, 16), expected_num_non_trainable_weights=0,
                      expected_num_losses=0, supports_masking=True,
                      # as Keras' own MultiHeadAttention test: its training check
                      # cannot feed the two named inputs
                      run_training_check=False, run_mixed_precision_check=False)
        self.run_layer_test(kr.PointwiseAttention,
                            init_kwargs=dict(num_heads=2, key_dim=4, activation="relu"),
                            expected_num_trainable_weights=8, **common)
        self.run_layer_test(kr.PointwiseAttention,
                            init_kwargs=dict(num_heads=2, key_dim=4, activation="softmax"),
                            expected_num_trainable_weights=8, **common)
        self.run_layer_test(kr.PointwiseAttention,
                            init_kwargs=dict(num_heads=2, key_dim=4, activation="gelu",
                                             qk_norm=True, gated=True, learned_scale=True,
                                             dropout=0.1),
                            expected_num_trainable_weights=8 + 2 + 2 + 1,
                            expected_num_seed_generators=1, **common)

    def test_position_embedding(self):
        self.run_layer_test(kr.PositionEmbedding,
                            init_kwargs=dict(grid_size=(2, 3), num_prefix_tokens=1),
                            input_shape=(2, 7, 8), expected_output_shape=(2, 7, 8),
                            expected_num_trainable_weights=1,
                            expected_num_non_trainable_weights=0)
        self.run_layer_test(kr.PositionEmbedding,
                            init_kwargs=dict(grid_size=(2, 3), kind="sincos2d"),
                            input_shape=(2, 6, 8), expected_output_shape=(2, 6, 8),
                            expected_num_trainable_weights=0, run_training_check=False)

    def test_class_and_register_tokens(self):
        self.run_layer_test(kr.ClassToken, init_kwargs=dict(num_tokens=3),
                            input_shape=(2, 5, 8), expected_output_shape=(2, 8, 8),
                            expected_num_trainable_weights=1,
                            expected_num_non_trainable_weights=0)

    def test_mlp_block(self):
        self.run_layer_test(kr.MLPBlock, init_kwargs=dict(mlp_dim=32, activation="gelu",
                                                          dropout=0.1),
                            input_shape=(2, 5, 8), expected_output_shape=(2, 5, 8),
                            expected_num_trainable_weights=4, expected_num_seed_generators=1)

    def test_encoder_block(self):
        self.run_layer_test(kr.EncoderBlock,
                            init_kwargs=dict(num_heads=2, mlp_dim=32, attention="relu",
                                             layer_scale=0.1),
                            input_shape=(2, 5, 8), expected_output_shape=(2, 5, 8),
                            # norm1/2 (4), q/k/v/o (8), qk-norm scales (2), MLP (4), ls1/ls2
                            expected_num_trainable_weights=20,
                            expected_num_non_trainable_weights=0,
                            run_mixed_precision_check=False)

    def test_map_head(self):
        self.run_layer_test(MAPHead, init_kwargs=dict(num_heads=2, mlp_dim=32,
                                                      attention="softmax"),
                            input_shape=(2, 5, 8), expected_output_shape=(2, 8),
                            # probe, q/k/v/o (8), qk-norm (2), norm (2), MLP (4)
                            expected_num_trainable_weights=17,
                            expected_num_non_trainable_weights=0,
                            run_mixed_precision_check=False)

    def test_image_preprocessor(self):
        self.run_layer_test(kr.ImagePreprocessor,
                            init_kwargs=dict(image_size=(16, 16), interpolation="bicubic",
                                             mean=(0.485, 0.456, 0.406),
                                             std=(0.229, 0.224, 0.225)),
                            input_shape=(2, 20, 24, 3), expected_output_shape=(2, 16, 16, 3),
                            expected_output_dtype="float32",
                            expected_num_trainable_weights=0,
                            expected_num_non_trainable_weights=0, run_training_check=False,
                            run_mixed_precision_check=False)
