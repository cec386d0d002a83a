"""Gymnasium environments of altenv; importing this package registers their ids."""
