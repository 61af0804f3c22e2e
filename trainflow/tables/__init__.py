"""Reading and writing tables: the table files (files: listing, schema, column kinds, fingerprints, task inference),
Delta and Iceberg sources at a snapshot (sources, snapshots), PostgreSQL (postgres), the prediction sinks (sinks),
outputs written whole (outputs), and the bundled sample tables (sample)."""
