"""Shared test fixtures. Servers started here listen on 127.0.0.1 only and are stopped by the test."""
