"""Small models written for the tests, each with the shape of its layers in a comment."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class TwoLayerMLP(nn.Module):
    def __init__(self, d_in=32, d_hidden=64, d_out=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):  # (B, d_in) -> (B, d_out)
        return self.fc2(self.act(self.fc1(x)))


class SharedLayer(nn.Module):
    """One Linear called twice, a functional matmul in the root, and a tied weight."""

    def __init__(self, d=16):
        super().__init__()
        self.shared = nn.Linear(d, d)
        self.other = nn.Linear(d, d, bias=False)
        self.other.weight = self.shared.weight

    def forward(self, x):  # (B, d)
        y = self.shared(self.shared(x))
        return self.other(y) @ x.T  # (B, B), a matmul owned by the root itself


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 10)

    def forward(self, x):  # (B, 3, H, W)
        x = F.relu(self.bn(self.conv(x)))
        x = F.max_pool2d(self.depthwise(x), 2)
        x = self.pool(self.up(x)).flatten(1)
        return self.fc(x)
