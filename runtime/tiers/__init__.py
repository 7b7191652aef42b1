"""KV tiers below the device pool: host memory and disk, behind the core's KV-connector seam."""
