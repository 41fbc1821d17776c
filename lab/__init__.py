"""Build and maintenance tooling (not the library): ``fedlib`` itself never imports from here."""
