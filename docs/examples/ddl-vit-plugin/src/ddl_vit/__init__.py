"""vit: a small Vision Transformer trained on generated images (an example ddl plugin)."""
