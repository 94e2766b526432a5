"""Decision rules: which arm each (workload class, load bucket) runs."""
