"""Config: schemas, semantic validation and one-line errors naming the field."""
