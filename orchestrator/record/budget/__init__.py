"""The study's trial budget: counted and claimed on the database, under one lock."""
