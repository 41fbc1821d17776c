"""Privacy attacks used as audits: membership inference, gradient inversion."""
