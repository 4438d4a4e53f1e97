"""Compiled core of etptr. Private: import public names from :mod:`etptr`."""
