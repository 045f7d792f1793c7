"""What is published: the one exposure decision, the immutable snapshots it builds, and
each flow's published contract (the JSON Schemas and argument specs)."""
