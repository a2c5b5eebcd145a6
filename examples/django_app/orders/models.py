from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    confirmed = models.BooleanField(default=False)


class Receipt(models.Model):
    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    text = models.CharField(max_length=200)
