"""chargpt: a small GPT trained on a generated character corpus (an example ddl plugin)."""
