from django.db import models


class Order(models.Model):
    cents = models.IntegerField()
    paid = models.BooleanField(default=False)


class Note(models.Model):
    """Written by tasks that then fail: shows what a failure keeps."""

    text = models.CharField(max_length=100)
