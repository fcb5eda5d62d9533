"""What a driver checks before it talks to a cluster."""

from __future__ import annotations

import pytest

from clients.versions import check_ray_version
from controller import PlacementError


@pytest.mark.parametrize(
    "version", ["2.48.0", "2.55.1", "2.60.0", "2.61.1", "3.0.0", "2.60.0rc1", "3.0.0.dev0"]
)
def test_ray_versions_that_keep_the_contract_are_accepted(version):
    check_ray_version(version)


@pytest.mark.parametrize("version", ["2.47.1", "2.9.3", "1.13.0"])
def test_older_ray_is_refused_with_the_version_to_install(version):
    with pytest.raises(PlacementError) as e:
        check_ray_version(version)
    assert str(e.value) == (
        f'placectl needs Ray >= 2.48, this is Ray {version}: pip install "ray[default]>=2.48"'
    )
