"""What users run beside the service: ``replay``, the ``bench`` load test, ``doctor``,
``build-engine`` and the video annotation they share."""
