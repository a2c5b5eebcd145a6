"""rainier_sync for Django."""
