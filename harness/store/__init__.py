"""The store: tables and every query (SQLite default, PostgreSQL for teams). The only
importer of SQLAlchemy. Records in, records out."""
