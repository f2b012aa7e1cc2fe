"""Per-op sharding rules as data: the rule kinds (autopar.ops.kinds) and the table of every
supported ATen op (autopar.ops.table, by family in autopar.ops.nn and autopar.ops.indexing)."""
