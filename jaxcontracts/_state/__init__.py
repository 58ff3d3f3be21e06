"""States: fields and annotations, specs, validation, construction,
foreign pytrees, equinox filtering."""
