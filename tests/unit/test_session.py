"""What a driver checks before it talks to a cluster."""

from __future__ import annotations

import pytest

from clients.versions import check_ray_version
from controller import PlacementError


@pytest.mark.parametrize("version", ["2.60.0", "2.61.1", "3.0.0", "2.60.0rc1", "3.0.0.dev0"])
def test_ray_versions_that_keep_the_contract_are_accepted(version):
    check_ray_version(version)


@pytest.mark.parametrize("version", ["2.59.0", "2.50.1", "1.13.0"])
def test_older_ray_is_refused_with_the_version_to_install(version):
    with pytest.raises(PlacementError, match=rf"needs Ray >= 2\.60, this is Ray {version}"):
        check_ray_version(version)
