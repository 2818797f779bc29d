"""The RL Unplugged source: GZIP TFRecord shards of ``tf.train.Example`` episodes, PNG frames."""
