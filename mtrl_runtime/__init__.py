"""The mtrl coordinator: policy endpoint, engines, trajectory store, trainer."""
