"""Maintenance campaigns: a firmware/driver baseline, maintenance windows, and the campaign
planner that orders rolling updates against a capacity floor and failure domains.

Pure functions over inventories and time: the control plane runs campaigns on top of these.
"""
