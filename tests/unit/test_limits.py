"""API limits read from botocore's service model, and the validators' messages."""

import pytest
from shoal import limits
from shoal.errors import InputError, ValidationError


def test_limits_come_from_the_service_model():
    assert limits.JOB_NAME_MAX == 63
    assert (limits.RETRY_MIN, limits.RETRY_MAX) == (1, 30)
    assert (limits.HYPERPARAMETERS_MAX, limits.HYPERPARAMETER_KEY_MAX,
            limits.HYPERPARAMETER_VALUE_MAX) == (100, 256, 2500)
    assert (limits.SUBNETS_MAX, limits.SECURITY_GROUPS_MAX, limits.TAGS_MAX) == (16, 5, 50)
    assert limits.ENVIRONMENT_MAX == 100 and limits.ENVIRONMENT_KEY_MAX == 512
    assert "ml.p4d.24xlarge" in limits.INSTANCE_TYPES
    assert set(limits.INPUT_MODES) == {"File", "Pipe", "FastFile"}


def test_java_character_classes_are_translated():
    assert limits.TAG_PATTERN.fullmatch("Équipe ML: a/b=c+d@e-f_g.h")
    assert not limits.TAG_PATTERN.fullmatch("a#b")
    assert limits.ENVIRONMENT_KEY_PATTERN.fullmatch("_OK_1")
    assert not limits.ENVIRONMENT_KEY_PATTERN.fullmatch("1BAD")


def test_shape_walks_lists_and_maps():
    assert limits.shape("Environment{v}").type_name == "string"
    assert limits.shape("InputDataConfig[].ChannelName").metadata["max"] == 64


@pytest.mark.parametrize("validator, value, message", [
    (limits.between(1, 30), 99, "'x' must be <= 30 (got 99)"),
    (limits.between(1), 0, "'x' must be >= 1 (got 0)"),
    (limits.between(1), True, "'x' must be an int (got True)"),
    (limits.text(max_len=3), "abcd", "'x' must be at most 3 characters (got 'abcd')"),
    (limits.text(limits.JOB_NAME_PATTERN), "a_b", "'x' must match regex"),
    (limits.one_of(("a", "b")), "c", "'x' must be in ('a', 'b') (got 'c')"),
    (limits.items(2), [1, 2, 3], "'x' must have at most 2 entries (got 3 entries)"),
    (limits.items(each=limits.between(0)), [1, -1], "'x[1]' must be >= 0 (got -1)"),
    (limits.s3_uri(), "https://h/x", "'x' must be an S3 URI"),
    (limits.boolean, "no", "'x' must be a bool (got 'no')"),
])
def test_validator_messages(validator, value, message):
    with pytest.raises(ValidationError) as caught:
        validator(None, "x", value)
    assert str(caught.value) == message or message in str(caught.value)


def test_none_passes_and_error_class_is_chosen():
    limits.between(1)(None, "x", None)
    with pytest.raises(InputError):
        limits.text(max_len=1, error=InputError)(None, "x", "ab")
